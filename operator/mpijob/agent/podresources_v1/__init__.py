"""Generated client stubs of the kubelet's pod-resources API v1 (k8s.io/kubelet@v0.34.7, pkg/apis/podresources/v1/api.proto).

Regenerate with hack/gen-podresources.sh; never edit by hand. Used by
mpijob.agent.podresources.
"""
