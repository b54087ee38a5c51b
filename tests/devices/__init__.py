"""Tests of devices: pairing, the device socket and signed HTTP, ACKs, images, the HUD, the Mac relay,
the owner's home, the simulator's command line."""
