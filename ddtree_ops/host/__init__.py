"""What runs on the GPU host as root: releases (install, check, switch, prune), the preflight
(its zipapp runs before ddtree-ops is installed), diagnose, ports, the CUDA toolkit and ptxas
checks, GPU facts."""
