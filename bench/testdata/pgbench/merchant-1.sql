SELECT m.id || ' ' || m.api_key_hash FROM merchants m WHERE m.name = 'bench-1';
