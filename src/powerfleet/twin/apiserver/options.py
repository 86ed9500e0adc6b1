"""What the loopback server enforces, as a real kube-apiserver does (docs/cluster.md, "Fidelity")."""

from __future__ import annotations

from dataclasses import dataclass

from powerfleet.twin.fidelity import KEEP_FOREIGN_DGD_STATUS


@dataclass(frozen=True)
class ServerOptions:
    # DELETE of a scheduled pod sets deletionTimestamp and keeps it for its grace period (the
    # request's gracePeriodSeconds, else spec.terminationGracePeriodSeconds, else 30); 0 removes it.
    graceful_pod_deletion: bool = True
    # Structural schemas of the custom resources (crds/): prune unknown fields, apply defaults,
    # validate, honour fieldValidation.
    schemas: bool = True
    # Custom resources are stored in their CRD's storage version and served converted in every
    # served version (conversion.py); off: an object comes back in the form it was written.
    convert: bool = True
    # Prune unknown fields of a DGD's status too (the real server does; see twin/fidelity.py).
    prune_dgd_status: bool = not KEEP_FOREIGN_DGD_STATUS
