#!/bin/sh
# Makes the certificates of Temporal's mutual TLS in docker-compose.yml, once: a CA; the server's
# certificate (named "temporal": the frontend's, and the services' between themselves), into
# SERVER_DIR, which only the server mounts; and one client certificate for kasa, the Web UI and
# the admin tools, into CLIENT_DIR. A later start keeps them. The CA's key is deleted once both
# are signed, so nothing else can ever be issued under it: to make new ones (they last 825 days),
# remove the two volumes (docker volume rm <project>_temporal-server-certs
# <project>_temporal-client-certs) and start again.
set -eu
server="${SERVER_DIR:-/certs/server}"
client="${CLIENT_DIR:-/certs/client}"
# The keys are moved in last: with both there, everything is.
if [ -f "$server/temporal-key.pem" ] && [ -f "$client/client-key.pem" ]; then
	echo "temporal certificates kept"
	exit 0
fi
command -v openssl >/dev/null || apk add --no-cache openssl >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key ca-key.pem
openssl req -x509 -new -key ca-key.pem -days 825 -subj "/CN=kasa compose Temporal CA" -out ca.pem

# issue NAME SUBJECT_ALT_NAMES EXTENDED_KEY_USAGE
issue() {
	key "$1-key.pem"
	openssl req -new -key "$1-key.pem" -subj "/CN=$1" -out "$1.csr"
	printf 'subjectAltName=%s\nextendedKeyUsage=%s\n' "$2" "$3" >"$1.ext"
	openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 825 -extfile "$1.ext" -out "$1.pem" 2>/dev/null
}
issue temporal "DNS:temporal,DNS:localhost,IP:127.0.0.1" "serverAuth,clientAuth"
issue client "DNS:client" "clientAuth"

# place FILE DIR: copy, then rename into place, so a file there is whole. The containers that
# mount a directory run as users of their own: the files are readable by all of them, and each
# directory is mounted only where its key is needed.
place() {
	cp "$1" "$2/.$1.tmp"
	chmod 0644 "$2/.$1.tmp"
	mv "$2/.$1.tmp" "$2/$1"
}
mkdir -p "$server" "$client"
place ca.pem "$server"
place temporal.pem "$server"
place ca.pem "$client"
place client.pem "$client"
place temporal-key.pem "$server"
place client-key.pem "$client"
echo "temporal certificates made"
