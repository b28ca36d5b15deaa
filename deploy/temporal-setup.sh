#!/bin/sh
# Creates kasa's namespace and registers the search attributes its workflows set, then exits;
# docker-compose.yml's temporal-setup service runs it once the server answers. Both steps leave
# what exists alone, so it is safe on every `docker compose up`. The CLI reads the server's
# address from TEMPORAL_ADDRESS; TEMPORAL_NAMESPACE and TEMPORAL_RETENTION come from compose, and
# the client certificate of the server's mutual TLS from TEMPORAL_TLS_CERT, TEMPORAL_TLS_KEY,
# TEMPORAL_TLS_CA and TEMPORAL_TLS_SERVER_NAME.
set -eu

ns="${TEMPORAL_NAMESPACE:?}"
temporal() {
	command temporal "$@" --tls-cert-path "${TEMPORAL_TLS_CERT:?}" --tls-key-path "${TEMPORAL_TLS_KEY:?}" \
		--tls-ca-path "${TEMPORAL_TLS_CA:?}" --tls-server-name "${TEMPORAL_TLS_SERVER_NAME:?}"
}

# The frontend reports SERVING a few seconds before the rest of the cluster (history shards,
# the system namespace) is ready to serve namespace calls: retry for up to a minute.
tries=0
until temporal operator namespace describe --namespace "$ns" >/dev/null 2>&1 ||
	temporal operator namespace create --namespace "$ns" --retention "${TEMPORAL_RETENTION:?}"; do
	tries=$((tries + 1))
	if [ "$tries" -ge 30 ]; then
		echo "namespace $ns: the server did not accept it within a minute" >&2
		exit 1
	fi
	sleep 2
done

# One attribute per call: the CLI pairs each --name with one --type. Registering an attribute
# that exists with the same type is a no-op on SQL visibility.
for sa in PaymentStatus:Keyword MerchantId:Keyword PaymentSummary:Keyword; do
	tries=0
	until temporal operator search-attribute create --namespace "$ns" --name "${sa%%:*}" --type "${sa#*:}"; do
		tries=$((tries + 1))
		if [ "$tries" -ge 30 ]; then
			echo "search attribute ${sa%%:*} of $ns: not registered within a minute" >&2
			exit 1
		fi
		sleep 2
	done
done
echo "namespace $ns ready with search attributes PaymentStatus, MerchantId and PaymentSummary"
