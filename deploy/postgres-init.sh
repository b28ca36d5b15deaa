#!/bin/sh
# Roles and databases for docker-compose.yml. The postgres image runs this once, as the
# superuser, when it creates a new cluster (an empty postgres-data volume). It creates only what
# is missing and sets the roles' passwords, so it can run again on a volume made by an earlier
# compose file: docker compose exec postgres sh /docker-entrypoint-initdb.d/10-roles.sh
#
# The passwords come from the environment (.env, made by deploy/compose-env.sh): none is written
# in the repository. docs/operations.md ("Database roles") explains the split and
# docs/deployment.md the rest.
set -eu
psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:?}" --dbname "${POSTGRES_DB:?}" \
	-v owner_pw="${KASA_DB_OWNER_PASSWORD:?}" -v app_pw="${KASA_DB_APP_PASSWORD:?}" \
	-v temporal_pw="${KASA_TEMPORAL_DB_PASSWORD:?}" <<'SQL'
-- kasa's tables belong to kasa_owner, which only `kasa migrate` logs in as. kasa_app is what the
-- API, workers and relay log in as: migrate grants it schema/grants.sql and nothing else. It is
-- neither a member of kasa_owner nor a superuser, so it can neither alter nor drop the ledger's
-- tables and triggers. Temporal's role owns Temporal's two databases (history and visibility),
-- which the temporal-schema service fills with the schema of the server's release.
SELECT format('CREATE ROLE %I LOGIN', r) FROM unnest(ARRAY['kasa_owner', 'kasa_app', 'temporal']) AS r
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) \gexec
ALTER ROLE kasa_owner LOGIN PASSWORD :'owner_pw';
ALTER ROLE kasa_app LOGIN PASSWORD :'app_pw';
ALTER ROLE temporal LOGIN PASSWORD :'temporal_pw';

-- POSTGRES_DB created the database as the superuser's; PostgreSQL 15's public schema belongs to
-- the database owner, so this also gives kasa_owner (alone) CREATE in it.
ALTER DATABASE kasa OWNER TO kasa_owner;
REVOKE ALL ON DATABASE kasa FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE kasa TO kasa_app;

SELECT format('CREATE DATABASE %I OWNER temporal', d) FROM unnest(ARRAY['temporal', 'temporal_visibility']) AS d
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = d) \gexec
REVOKE ALL ON DATABASE temporal FROM PUBLIC;
REVOKE ALL ON DATABASE temporal_visibility FROM PUBLIC;
SQL
