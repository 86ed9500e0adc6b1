"""powerfleet.cluster: the deployment (DGD) model, power inputs, settlement, immutability,
the cluster ports and their Kubernetes implementation (``powerfleet.cluster.kube``).

See docs/cluster.md.
"""

from powerfleet.cluster.dgd import (
    DGD,
    DGD_API_VERSION,
    DGD_GROUP,
    DGD_KIND,
    DGD_PLURAL,
    DGD_VERSION,
    GPU_RESOURCE,
    LABEL_COMPONENT,
    LABEL_DGD_NAME,
    POWER_ANNOTATION,
    Component,
    ComponentType,
    RolloutPhase,
    parse_dgd,
)
from powerfleet.cluster.errors import DGDFormatError, DGDInputError, PowerInputError
from powerfleet.cluster.immutability import (
    AdmittedPowerInputs,
    Violation,
    admit_power_inputs,
    check_power_inputs_unchanged,
    validate_dgd_update,
)
from powerfleet.cluster.objects import EventInfo, Lease, ObjectRef, PodInfo
from powerfleet.cluster.ports import (
    ClusterError,
    ClusterReader,
    ClusterWriter,
    Conflict,
    InvalidDGD,
    LeaseConflict,
    NotFound,
    PodEvent,
)
from powerfleet.cluster.power import (
    CapAnnotation,
    PowerConfig,
    Role,
    RolePower,
    parse_power_annotation,
    resolve_power_config,
    watts_per_replica,
)
from powerfleet.cluster.settlement import Settlement, SettlementState, settle

__all__ = [
    "DGD", "DGD_API_VERSION", "DGD_GROUP", "DGD_KIND", "DGD_PLURAL", "DGD_VERSION", "GPU_RESOURCE",
    "LABEL_COMPONENT", "LABEL_DGD_NAME", "POWER_ANNOTATION", "AdmittedPowerInputs", "CapAnnotation",
    "ClusterError", "ClusterReader", "ClusterWriter", "Component", "ComponentType", "Conflict",
    "DGDFormatError", "DGDInputError", "EventInfo", "InvalidDGD", "Lease", "LeaseConflict", "NotFound",
    "ObjectRef", "PodEvent", "PodInfo", "PowerConfig", "PowerInputError", "Role", "RolePower",
    "RolloutPhase", "Settlement", "SettlementState", "Violation", "admit_power_inputs",
    "check_power_inputs_unchanged", "parse_dgd", "parse_power_annotation", "resolve_power_config",
    "settle", "validate_dgd_update", "watts_per_replica",
]
