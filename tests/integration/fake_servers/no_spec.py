"""A server whose serve_forever takes no `spec` (it loads the plant itself)."""

import json


def serve_forever(scenario, image_name, ready=None, stop=None, *, summary_path=None, request_log_path=None,
                  shared_list_path=None):
    with open(summary_path, "w") as f:
        json.dump({"started": True}, f)
    ready.set()
    stop.wait(30.0)
