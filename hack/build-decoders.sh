#!/usr/bin/env bash
# Builds the CNI plugins' own config decoders, for the differential test of cnidra's tenant
# decoding (tests/cni/test_decoders.py): each plugin's package from the Go module proxy's copy of
# the release, unchanged, plus one file that, when CNIDRA_DECODE is set, reads JSON lines from
# stdin into that plugin's own config struct with encoding/json (exactly as the plugin does) and
# writes what the struct holds. Cached by release; idempotent; prints the cache directory.
set -euo pipefail

CNI_PLUGINS_VERSION="${CNI_PLUGINS_VERSION:-v1.9.1}"
CACHE="${CNIDRA_CACHE:-$HOME/.cache/cnidra}"
OUT="$CACHE/cni-decoders-$CNI_PLUGINS_VERSION"
MODULE=github.com/containernetworking/plugins

if [[ -f "$OUT/.complete" ]]; then echo "$OUT"; exit 0; fi

# plugin  package directory  config type (the struct the plugin unmarshals its stdin into)
PLUGINS="
bridge plugins/main/bridge NetConf
host-device plugins/main/host-device NetConf
ipvlan plugins/main/ipvlan NetConf
macvlan plugins/main/macvlan NetConf
ptp plugins/main/ptp NetConf
tap plugins/main/tap NetConf
vlan plugins/main/vlan NetConf
bandwidth plugins/meta/bandwidth PluginConf
firewall plugins/meta/firewall FirewallNetConf
portmap plugins/meta/portmap PortMapConf
sbr plugins/meta/sbr PluginConf
tuning plugins/meta/tuning TuningConf
vrf plugins/meta/vrf VRFNetConf
static plugins/ipam/static Net
dhcp plugins/ipam/dhcp NetConf
host-local plugins/ipam/host-local allocator.Net
"

work="$(mktemp -d /tmp/cnidra-decoders.XXXXXX)"
trap 'rm -rf "$work"' EXIT
export GOFLAGS="-buildvcs=false -trimpath -mod=mod" CGO_ENABLED=0
src="$(cd "$work" && go mod download -json "$MODULE@$CNI_PLUGINS_VERSION" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"

cd "$work"
go mod init cnidra.local/decoders >/dev/null 2>&1
go mod edit -require="$MODULE@$CNI_PLUGINS_VERSION"
while read -r name dir type; do
  [[ -z "$name" ]] && continue
  mkdir -p "$name"
  for f in "$src/$dir"/*.go; do
    [[ "$f" == *_test.go ]] && continue
    cp "$f" "$name/"; chmod u+w "$name/$(basename "$f")"
  done
  imports='"bufio"; "encoding/json"; "os"'
  if [[ "$type" == allocator.* ]]; then
    imports="$imports; \"$MODULE/plugins/ipam/host-local/backend/allocator\""
  fi
  cat >"$name/zz_cnidra_decode.go" <<EOF
package main

import ($imports)

// Added by cnidra's hack/build-decoders.sh: the plugin's own config struct, filled by
// encoding/json from each stdin line, written back as JSON; one output line per input line.
func init() {
	if os.Getenv("CNIDRA_DECODE") == "" {
		return
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		conf := $type{}
		if err := json.Unmarshal(in.Bytes(), &conf); err != nil {
			_ = out.Encode(map[string]string{"error": err.Error()})
			continue
		}
		_ = out.Encode(map[string]interface{}{"conf": conf})
	}
	os.Exit(0)
}
EOF
done <<<"$PLUGINS"
go mod tidy >/dev/null 2>&1 || go mod tidy
rm -rf "$OUT.tmp"; mkdir -p "$OUT.tmp"
go build -o "$OUT.tmp/" ./...
touch "$OUT.tmp/.complete"
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
echo "$OUT"
