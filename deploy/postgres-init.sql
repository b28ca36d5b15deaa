-- Roles and databases for docker-compose.yml. The postgres image runs this once, as the
-- superuser, when it creates a new cluster (an empty postgres-data volume); on a volume made by an
-- earlier compose file run it by hand: docker compose exec -T postgres psql -U postgres -f - < deploy/postgres-init.sql
--
-- The passwords are the compose file's development values (the port is published on loopback
-- only); a real deployment creates the same roles with passwords from its secret store.
-- docs/operations.md ("Database roles") explains the split and docs/deployment.md the rest.

-- kasa's tables belong to kasa_owner, which only `kasa migrate` logs in as. kasa_app is what the
-- API, workers and relay log in as: migrate grants it schema/grants.sql and nothing else. It is
-- neither a member of kasa_owner nor a superuser, so it can neither alter nor drop the ledger's
-- tables and triggers.
CREATE ROLE kasa_owner LOGIN PASSWORD 'kasa_owner';
CREATE ROLE kasa_app LOGIN PASSWORD 'kasa_app';
-- POSTGRES_DB created the database as the superuser's; PostgreSQL 15's public schema belongs to
-- the database owner, so this also gives kasa_owner (alone) CREATE in it.
ALTER DATABASE kasa OWNER TO kasa_owner;
REVOKE ALL ON DATABASE kasa FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE kasa TO kasa_app;

-- Temporal Server's own role and its two databases (history and visibility), which the
-- temporal-schema service fills with the schema of the server's release.
CREATE ROLE temporal LOGIN PASSWORD 'temporal';
CREATE DATABASE temporal OWNER temporal;
CREATE DATABASE temporal_visibility OWNER temporal;
REVOKE ALL ON DATABASE temporal FROM PUBLIC;
REVOKE ALL ON DATABASE temporal_visibility FROM PUBLIC;
