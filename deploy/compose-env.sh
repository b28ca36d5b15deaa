#!/bin/sh
# Writes the secrets docker-compose.yml needs into ./.env (or the file given), each a fresh
# random value, and keeps every one already there: running it again changes nothing. Keep .env
# out of git, and back up KASA_SECRET_KEY: the webhook secrets are sealed with it.
set -eu
env_file="${1:-.env}"
touch "$env_file"
chmod 0600 "$env_file"
# A last line without its newline would run into the first one added.
if [ -s "$env_file" ] && [ -n "$(tail -c1 "$env_file")" ]; then
	echo >>"$env_file"
fi
random() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }
add() {
	if ! grep -q "^$1=" "$env_file"; then
		echo "$1=$2" >>"$env_file"
		echo "compose-env: $1 added to $env_file"
	fi
}
add KASA_SECRET_KEY "$(random 32)"
add KASA_ADMIN_TOKEN "$(random 24)"
add KASA_POSTGRES_PASSWORD "$(random 16)"
add KASA_DB_OWNER_PASSWORD "$(random 16)"
add KASA_DB_APP_PASSWORD "$(random 16)"
add KASA_TEMPORAL_DB_PASSWORD "$(random 16)"
add KASA_UI_PASSWORD "$(random 12)"
add KASA_GRAFANA_PASSWORD "$(random 12)"
