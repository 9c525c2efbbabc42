"""Policies: the versioned policy store, loaders (module:attribute, ONNX, stored versions),
the demo MLP ensemble, its fitting by imitation, and the policy process (`runner`)."""
