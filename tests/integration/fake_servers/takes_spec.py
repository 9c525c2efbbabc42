"""A server that takes the loop's PlantSpec (as adapters.modbus / adapters.opcua do)."""

import json


def serve_forever(scenario, image_name, ready=None, stop=None, *, summary_path=None, spec=None, **_):
    with open(summary_path, "w") as f:
        json.dump({"spec_outputs": None if spec is None else list(spec.names("outputs"))}, f)
    ready.set()
    stop.wait(30.0)
