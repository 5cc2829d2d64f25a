"""What drives many hosts from the controller: the fleet's SSH transport, rolling upgrades,
sweeps."""
