-- The schema unqualified names resolve to in a session.
SELECT current_schema();
