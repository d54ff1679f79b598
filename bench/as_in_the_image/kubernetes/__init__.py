"""The operator's Python as the image has it: no `kubernetes` client (the `[cloud]` extra
is only for exec-plugin logins, operator/login.py). kopf imports the client whenever it
finds it, which costs about 19 MiB; with this first on the path, kopf finds none and the
operator's memory is measured as it runs in a pod."""

raise ImportError("the kubernetes client is not in the image")
