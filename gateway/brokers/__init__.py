"""The embedded MQTT broker ``iotgw serve`` starts when no ``--broker`` is given:

- ``embedded``: which broker runs (Mosquitto when installed, else amqtt in-process) and the
  protocol both share;
- ``mosquitto``: the Mosquitto child, its configuration, folder and lifetime;
- ``amqtt_auth``: amqtt's password-file plugin, reading ``mosquitto_passwd``'s hashes.
"""
