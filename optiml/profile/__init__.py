"""Hardware feedback: static resource analysis (ptxas, occupancy) now; Nsight Compute profiles later."""
