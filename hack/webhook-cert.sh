#!/usr/bin/env bash
# The deploy step for the webhook's TLS: a CA and a serving certificate for
# cnidra-webhook.cnidra-system.svc, the Secret cnidra-webhook-tls, and deploy/webhook.yaml applied
# with the CA as caBundle. Run with a kubeconfig of a cluster admin; re-running rotates both.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$(mktemp -d)"; trap 'rm -rf "$dir"' EXIT
svc=cnidra-webhook.cnidra-system.svc
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 \
  -subj "/CN=cnidra-webhook-ca" -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$svc" \
  -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:%s.cluster.local\n' "$svc" "$svc" > "$dir/ext"
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
  -days 365 -extfile "$dir/ext" -out "$dir/tls.crt" 2>/dev/null
kubectl -n cnidra-system create secret tls cnidra-webhook-tls --cert "$dir/tls.crt" \
  --key "$dir/tls.key" --dry-run=client -o yaml | kubectl apply -f -
sed "s|CA_BUNDLE|$(base64 -w0 < "$dir/ca.crt")|" deploy/webhook.yaml | kubectl apply -f -
