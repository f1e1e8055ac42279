# Sourced by hack/*.sh: hack/versions.env's pins, with the Kubernetes minor resolved as
# hack/common.py versions() resolves it (K8S_VERSION from the environment, else
# DEFAULT_K8S_VERSION; each KEY_<major>_<minor> pin of that minor becomes KEY).
# shellcheck shell=bash
_versions_env=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/versions.env
_k8s=${K8S_VERSION:-}
# shellcheck source=versions.env
source "$_versions_env"
K8S_VERSION=${_k8s:-$DEFAULT_K8S_VERSION}
case " $K8S_VERSIONS " in
  *" $K8S_VERSION "*) ;;
  *) printf 'K8S_VERSION=%s: the local cluster runs one of %s (hack/versions.env); set K8S_VERSION to one of them, or unset it for %s\n' \
       "$K8S_VERSION" "$K8S_VERSIONS" "$DEFAULT_K8S_VERSION" >&2
     exit 2;;
esac
_suffix=_${K8S_VERSION//./_}
while IFS='=' read -r _key _value; do
  printf -v "${_key%"$_suffix"}" '%s' "$_value"
done < <(grep -E "^[A-Z0-9_]+${_suffix}=" "$_versions_env")
export K8S_VERSION
unset _versions_env _k8s _suffix _key _value
