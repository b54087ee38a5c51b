"""What the tests share that is not a test: helper modules, local fakes and servers speaking real wire
protocols, free ports, and data files (data/)."""
