"""HBM peaks by GPU name (the vendor's figures), for the decode tables' % and the plots' lines: the GPU a run was on,
no torch needed (bench/plot_decode_ab.py reads logs without one)."""
HBM_PEAKS_GBS = {"H200": 4800.0, "H100 80GB HBM3": 3350.0, "H100 NVL": 3900.0, "H100 PCIe": 2000.0}


def hbm_peak_gbs(gpu):
    """The peak of the first name contained in `gpu`, or 0.0 when none is."""
    return next((v for k, v in HBM_PEAKS_GBS.items() if k in gpu), 0.0)
