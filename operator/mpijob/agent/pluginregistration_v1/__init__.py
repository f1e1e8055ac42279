"""Generated stubs of the kubelet's plugin registration API (k8s.io/kubelet@v0.34.7, pkg/apis/pluginregistration/v1/api.proto).

Regenerate with hack/gen-csi.sh; never edit by hand. Used by mpijob.agent.csi.
"""
