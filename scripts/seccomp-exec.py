#!/usr/bin/env python3
"""seccomp-exec.py PROFILE.json COMMAND [ARGS...]: runs COMMAND under the
allow-list of an OCI/Docker seccomp profile (the subset ringlock's profile
uses: defaultAction SCMP_ACT_ERRNO with defaultErrnoRet, and syscalls entries
with action SCMP_ACT_ALLOW), the way a container runtime would apply it
right before exec. Needs libseccomp's Python bindings (Debian package
python3-seccomp). Names the running kernel's architecture does not know are
skipped, as runc does."""
import errno
import json
import os
import sys

import seccomp

if len(sys.argv) < 3:
    sys.exit(__doc__)
profile = json.load(open(sys.argv[1]))
if profile.get("defaultAction") != "SCMP_ACT_ERRNO":
    sys.exit("seccomp-exec: only defaultAction SCMP_ACT_ERRNO profiles are supported")
f = seccomp.SyscallFilter(defaction=seccomp.ERRNO(profile.get("defaultErrnoRet", errno.EPERM)))
for rule in profile["syscalls"]:
    if rule["action"] != "SCMP_ACT_ALLOW" or rule.get("args"):
        sys.exit(f"seccomp-exec: unsupported rule {rule}")
    for name in rule["names"]:
        try:
            f.add_rule(seccomp.ALLOW, name)
        except (RuntimeError, ValueError, OSError):
            pass  # not a syscall on this architecture
# Like a runtime with no_new_privs: required to load a filter unprivileged.
f.set_attr(seccomp.Attr.CTL_NNP, 1)
f.load()
os.execvp(sys.argv[2], sys.argv[2:])
