-- One row that readiness rewrites: a write that commits proves the database can write.
CREATE TABLE store_probe (id INTEGER PRIMARY KEY CHECK (id = 1), n BIGINT NOT NULL);
INSERT INTO store_probe (id, n) VALUES (1, 0);
