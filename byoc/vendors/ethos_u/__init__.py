"""The `ethos_u` vendor: its data sheet (`data_sheet`), which registers it, and what running its
regions needs (`runtime`), which an artifact loads without byoc's compiler or Vela (see
byoc.backend.runtime)."""

from byoc.exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(["ethos_u_backend", "partition_for_ethos_u"], "byoc.vendors.ethos_u.data_sheet"),
    **dict.fromkeys(["ETHOS_U_PAYLOAD", "EthosUSettings"], "byoc.vendors.ethos_u.runtime"),
})
