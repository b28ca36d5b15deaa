SELECT string_agg(nspname, ',') FROM pg_namespace WHERE nspname LIKE 'kasa\_pgbench%';
