"""A real Kubernetes control plane (etcd, kube-apiserver, and on request kube-scheduler,
kube-controller-manager and kwok) started from the binaries ``controlplane/build.sh`` builds; the
``control_plane`` test tier's fixtures (tests/control_plane/conftest.py) and docs/twin.md use it."""

from .nodes import GPU, GPU_TAINT, RACK_LABEL, gpu_node
from .plane import ControlPlane, built_bin_dir, kubeconfig_text

__all__ = ["GPU", "GPU_TAINT", "RACK_LABEL", "ControlPlane", "built_bin_dir", "gpu_node", "kubeconfig_text"]
