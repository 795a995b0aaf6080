"""SGLang integration: the dump hook (``hook.make_hook``) and the launcher (``launcher``)."""
