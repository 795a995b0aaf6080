"""What a dump and a stored sample hold, byte for byte: ``dumps`` (a dump's folder: ``hidden.safetensors``,
its metadata, the done marker), ``dump_dir`` (the dump root both sides check), ``tensor_file`` (the
safetensors header read without torch), ``fp8`` (the per-token FP8 scheme), ``storages`` (the storage
dtypes an output may ask for), ``finite`` (NaN and infinity found fast). Imports ``durable`` and the
rest of ``contract``."""
