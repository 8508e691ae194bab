#!/usr/bin/env bash
# Makes sure the brokers the Messaging Gateway's tests use answer on loopback: RabbitMQ
# (5672, guest/guest), NATS with JetStream (4222) and Mosquitto (1883). Installs Debian's
# packages and starts each server when it is not running.
set -euo pipefail

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_up() {
  for _ in $(seq 1 120); do
    up "$1" && return 0
    sleep 0.5
  done
  echo "ensure-brokers: nothing answers on port $1" >&2
  return 1
}

install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "$@" >/dev/null
}

if ! up 5672; then
  command -v rabbitmq-server >/dev/null 2>&1 || install rabbitmq-server
  echo "ensure-brokers: starting RabbitMQ" >&2
  rabbitmq-server -detached
  wait_up 5672
fi

if ! up 4222; then
  command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || install nats-server
  echo "ensure-brokers: starting NATS with JetStream" >&2
  mkdir -p /var/lib/nats-server /var/log
  start-stop-daemon --start --oknodo --background --exec "$(command -v nats-server || echo /usr/sbin/nats-server)" \
    -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  wait_up 4222
fi

if ! up 1883; then
  command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || install mosquitto
  echo "ensure-brokers: starting Mosquitto" >&2
  "$(command -v mosquitto || echo /usr/sbin/mosquitto)" -d -c /etc/mosquitto/mosquitto.conf
  wait_up 1883
fi
echo "ensure-brokers: RabbitMQ, NATS and Mosquitto are up"
