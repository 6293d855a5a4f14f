"""What the machine offers: devices, memory and CPU threads.

- :mod:`specformer.machine.devices`: a device a user named, checked;
- :mod:`specformer.machine.memory`: refusing a model the machine cannot hold;
- :mod:`specformer.machine.threads`: how many CPU threads a command uses.
"""
