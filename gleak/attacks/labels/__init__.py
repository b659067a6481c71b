"""Label-recovery attacks; importing this package registers them."""

from gleak.attacks.labels import calibrated, idlg, ilrg, llg, posterior, rlu, softlabel, zlg  # noqa: F401
