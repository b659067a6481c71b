"""Label-recovery attacks; importing this package registers them."""

from gleak.attacks.labels import idlg, ilrg, llg, zlg  # noqa: F401
