"""Generated stubs of the Container Storage Interface (github.com/container-storage-interface/spec@v1.9.0, csi.proto).

Regenerate with hack/gen-csi.sh; never edit by hand. Used by mpijob.agent.csi.
"""
