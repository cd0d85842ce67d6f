"""placeholder"""
from pathlib import Path
def default_drafter_dir(target_dir=None) -> Path:
    from . import zoo
    target_dir = Path(target_dir) if target_dir else zoo.zoo_root() / zoo.DEFAULT_SPEC.name / "target"
    return target_dir.parent / "dflash"
