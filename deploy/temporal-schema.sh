#!/bin/sh
# Brings Temporal's two databases to the schema of the admin-tools image's release, then exits;
# docker-compose.yml's temporal-schema service runs it before the server starts. Safe to run
# again: setup-schema only creates the version tables when they are missing, and update-schema
# applies the versions a database lacks. That is also how an upgrade of the server gets its
# schema changes: move both images to the new release and `docker compose up` runs this first.
# The connection comes from SQL_PLUGIN, SQL_HOST, SQL_PORT, SQL_USER and SQL_PASSWORD; the
# databases and the role exist already (deploy/postgres-init.sql).
set -eu

temporal-sql-tool --db temporal setup-schema -v 0.0
temporal-sql-tool --db temporal update-schema -d /etc/temporal/schema/postgresql/v12/temporal/versioned

temporal-sql-tool --db temporal_visibility setup-schema -v 0.0
temporal-sql-tool --db temporal_visibility update-schema -d /etc/temporal/schema/postgresql/v12/visibility/versioned
