"""The gRPC adapter: KServe's Open Inference Protocol service (with Triton's streaming and
repository calls), TF Serving's PredictionService and ModelService, grpc.health.v1 and server
reflection, over grpcio's asyncio server on the gateway's event loop. Like the HTTP and MQTT
adapters it only translates: requests go through the same ``Edge`` limits and the same
``InferenceService``, and every refusal is a ``GatewayError`` mapped to a status code here."""
