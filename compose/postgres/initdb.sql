-- Run once by the postgres image when its volume is new
-- (/docker-entrypoint-initdb.d), as the user ferry: one database per
-- broker profile of compose.yaml, so that profiles running side by side
-- never share an outbox (every profile's relay publishes the default
-- destination, so a relay of another profile on the same database would
-- publish a row to its own broker). The database ferry, the
-- CLI's default, is created by POSTGRES_DB and stays for host-side use.
CREATE DATABASE ferry_rabbitmq;
CREATE DATABASE ferry_nats;
CREATE DATABASE ferry_kafka;
CREATE DATABASE ferry_sqs;
