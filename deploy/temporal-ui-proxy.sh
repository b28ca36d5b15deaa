#!/bin/sh
# The Temporal Web UI's door in docker-compose.yml: Caddy asks for the operator's password
# (user "operator", KASA_UI_PASSWORD) before anything reaches the UI, which can signal, cancel
# and start workflows and is not published itself.
set -eu
hash=$(caddy hash-password --plaintext "${KASA_UI_PASSWORD:?}")
cat >/tmp/Caddyfile <<CADDY
:8233 {
	basic_auth {
		operator $hash
	}
	reverse_proxy temporal-ui:8080
}
CADDY
exec caddy run --config /tmp/Caddyfile --adapter caddyfile
