"""Protocol endpoints (Modbus TCP, OPC UA) onto the process image."""
