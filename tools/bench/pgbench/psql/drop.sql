-- Drops a fixture schema (psql variable schema) with everything in it.
DROP SCHEMA IF EXISTS :"schema" CASCADE;
