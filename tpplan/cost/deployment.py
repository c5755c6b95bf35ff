"""Deprecated home of the deployment type: it is `tpplan.mesh.Mesh` now (issue 30); this alias goes once
every import reads `tpplan.mesh`."""

from __future__ import annotations

from tpplan.mesh import Fabric, Mesh

Deployment = Mesh

__all__ = ["Deployment", "Fabric"]
