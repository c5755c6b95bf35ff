import atexit
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# AIC's answer cache (tpplan.cost.sources.aic_cache) goes to a folder of this session's own, never the user's.
if "TPPLAN_CACHE_DIR" not in os.environ:
    os.environ["TPPLAN_CACHE_DIR"] = tempfile.mkdtemp(prefix="tpplan-test-cache-")
    atexit.register(shutil.rmtree, os.environ["TPPLAN_CACHE_DIR"], True)
