SELECT m.id FROM merchants m WHERE m.name = 'bench-1';
