// Package compose holds ferry's deployment files, not Go code:
// docker-compose.yml (the servers and ferry's roles in containers, one
// broker per profile: rabbitmq, nats, sqs), Dockerfile (the ferry image) and
// local/services.sh (the same servers without Docker, for development and
// CI). Its test loads docker-compose.yml with the Compose specification's
// own loader and checks what a user relies on: the services, their
// healthchecks, ports at the ferry CLI's default addresses, and the
// environment of every ferry role.
package compose
