#!/bin/sh
# Makes the certificates of Temporal's mutual TLS in docker-compose.yml, once: a CA, the
# server's certificate (named "temporal": the frontend's, and the services' between themselves)
# and one client certificate for kasa, the Web UI and the admin tools. A later start keeps them;
# `docker compose down -v` makes new ones. The CA's key is deleted once both are signed, so
# nothing else can ever be issued under it.
set -eu
cd "${CERTS_DIR:-/certs}"
if [ -f ca.pem ]; then
	echo "temporal certificates kept ($(pwd))"
	exit 0
fi
command -v openssl >/dev/null || apk add --no-cache openssl >/dev/null

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
key ca-key.pem
openssl req -x509 -new -key ca-key.pem -days 825 -subj "/CN=kasa compose Temporal CA" -out ca.pem

# issue NAME SUBJECT_ALT_NAMES EXTENDED_KEY_USAGE
issue() {
	key "$1-key.pem"
	openssl req -new -key "$1-key.pem" -subj "/CN=$1" -out "$1.csr"
	printf 'subjectAltName=%s\nextendedKeyUsage=%s\n' "$2" "$3" >"$1.ext"
	openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 825 -extfile "$1.ext" -out "$1.pem"
	rm "$1.csr" "$1.ext"
}
issue temporal "DNS:temporal,DNS:localhost,IP:127.0.0.1" "serverAuth,clientAuth"
issue client "DNS:client" "clientAuth"
rm ca-key.pem ca.srl
# The server, the UI and kasa run as users of their own: the volume is mounted into these
# containers only.
chmod 0644 ./*.pem
echo "temporal certificates made"
