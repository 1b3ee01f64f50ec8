"""Deployment: an artifact with what running it needs where only TVM's runtime is installed.

`byoc deploy ARTIFACT -o DIR` (`deploy`) writes a folder a target machine takes as it is: the
artifact (with the engines a run without the compiler needs embedded), TVM's runtime (its Python
package without the 259 MB compiler library), the modules of byoc that loading and running
import, the pip packages they need (`requirements.txt`, pinned) and a loader of two lines. What
the folder must hold is found by running it (`probe`): the artifact is loaded and run once in a
process where TVM's compiler is not loaded, and what that process imported and mapped is what
the target needs. The folder is then checked where nothing else is on the path (`check`).
"""

from byoc.exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(["Deployment", "deploy"], "byoc.deploy.bundle"),
    "check": "byoc.deploy.check",
})

__all__ = ["Deployment", "check", "deploy"]
