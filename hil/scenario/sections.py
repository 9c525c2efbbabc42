"""The scenario's subsystem sections and the modules that own them: section key -> (module,
model class). Each module owns its section's schema and checks; hil/scenario/config.py validates a
section through its class, hil/scenario/signal_tables.py imports the modules so that they register
their signal tables."""

from __future__ import annotations

SUBSYSTEM_SECTIONS: dict[str, tuple[str, str]] = {
    "modbus": ("hil.tagmap.modbus", "ModbusSection"),
    "opcua": ("hil.tagmap.opcua", "OpcuaSection"),
    "iec104": ("hil.tagmap.iec104", "Iec104Section"),
    "softplc": ("hil.softplc.config", "SoftPlcSection"),
    "gaps": ("hil.gaps.config", "GapsSection"),
    "bus": ("hil.bus.config", "BusSection"),
    "safety": ("hil.safety.config", "SafetySection"),
    "policy": ("hil.safety.config", "PolicySection"),
    "gym": ("hil.gym.config", "GymSection"),
}
