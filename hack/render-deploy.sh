#!/usr/bin/env bash
# deploy/ is rendered from charts/cnidra (one source): the plain manifests for a cluster without
# Helm, with the chart's defaults and the namespace cnidra-system. `make deploy` runs this; a
# test fails when deploy/ and the chart disagree.
set -euo pipefail
cd "$(dirname "$0")/.."
helm="$(hack/install-helm.sh)"
render() {  # render <output> <template>...
  local out="$1"; shift
  {
    echo "# Rendered from charts/cnidra by \`make deploy\` (hack/render-deploy.sh): edit the chart."
    "$helm" template cnidra charts/cnidra --namespace cnidra-system --kube-version v1.37.2 \
      --set createNamespace=true \
      $(printf -- '--show-only templates/%s ' "$@")
  } > "$out"
}
render deploy/deviceclass.yaml deviceclasses.yaml
render deploy/rbac.yaml namespace.yaml serviceaccount.yaml rbac.yaml
render deploy/daemonset.yaml daemonset.yaml
render deploy/admission.yaml admission.yaml
{
  echo "# Copied from charts/cnidra/crds by \`make deploy\` (hack/render-deploy.sh): edit the chart."
  for crd in charts/cnidra/crds/*.yaml; do echo "---"; cat "$crd"; done
} > deploy/crds.yaml
