"""Tag maps: plant signals onto protocol addresses (Modbus) and nodes (OPC UA)."""
