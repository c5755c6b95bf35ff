"""`python -m tpplan` and the `tpplan` command (pyproject's script entry point)."""

import signal


def run() -> None:
    """The CLI. A Ctrl-C that lands while its modules still import (before `tpplan.signals` takes
    SIGINT over) ends the process as the signal does, without Python's KeyboardInterrupt traceback;
    where SIGINT was ignored from the start (a background job of a shell) it stays ignored."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    from tpplan.cli import main

    main()


if __name__ == "__main__":
    run()
