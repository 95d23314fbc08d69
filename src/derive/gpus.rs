//! Peak dense BF16/FP16 tensor throughput and memory bandwidth per GPU model, for MFU and
//! MBU. Dense figures only: NVIDIA datasheets print "with sparsity" numbers that are 2×
//! these. Sources: docs/derived.md, "MFU and MBU: peaks", which cites each vendor page.
//! The A10G is not here: NVIDIA publishes no tensor figure for it; configure numbers.

#[derive(Clone, Copy, Debug)]
pub struct GpuPeak {
    /// Names accepted in configuration (matched case-insensitively).
    pub names: &'static [&'static str],
    pub flops: f64,
    pub bandwidth: f64,
    pub source: &'static str,
}

pub const GPUS: &[GpuPeak] = &[
    GpuPeak {
        names: &["H100-SXM", "H100-SXM5", "H100"],
        flops: 989e12,
        bandwidth: 3.35e12,
        source: "NVIDIA H100 datasheet (1,979 TFLOPS with sparsity; 3.35 TB/s HBM3)",
    },
    GpuPeak {
        names: &["H100-PCIe"],
        flops: 756e12,
        bandwidth: 2.0e12,
        source: "NVIDIA H100 datasheet / product brief PB-11133-001",
    },
    GpuPeak {
        names: &["H100-NVL"],
        flops: 835e12,
        bandwidth: 3.9e12,
        source: "NVIDIA H100 datasheet",
    },
    GpuPeak {
        names: &["H200-SXM", "H200"],
        flops: 989e12,
        bandwidth: 4.8e12,
        source: "NVIDIA H200 product page (4.8 TB/s HBM3e)",
    },
    GpuPeak {
        names: &["H200-NVL"],
        flops: 835e12,
        bandwidth: 4.8e12,
        source: "NVIDIA H200 product page",
    },
    GpuPeak {
        names: &["A100-40GB", "A100-SXM4-40GB", "A100-PCIe-40GB"],
        flops: 312e12,
        bandwidth: 1.555e12,
        source: "NVIDIA A100 datasheet (1,555 GB/s HBM2)",
    },
    GpuPeak {
        names: &["A100-80GB", "A100-SXM4-80GB", "A100"],
        flops: 312e12,
        bandwidth: 2.039e12,
        source: "NVIDIA A100 datasheet (2,039 GB/s HBM2e)",
    },
    GpuPeak {
        names: &["A100-PCIe-80GB"],
        flops: 312e12,
        bandwidth: 1.935e12,
        source: "NVIDIA A100 datasheet (1,935 GB/s)",
    },
    GpuPeak {
        names: &["A10"],
        flops: 125e12,
        bandwidth: 600e9,
        source: "NVIDIA A10 datasheet",
    },
    GpuPeak {
        names: &["L40S"],
        flops: 362.05e12,
        bandwidth: 864e9,
        source: "NVIDIA L40S datasheet (BF16 362.05 | 733 with sparsity)",
    },
    GpuPeak {
        names: &["L4"],
        flops: 121e12,
        bandwidth: 300e9,
        source: "NVIDIA L4 datasheet (242 TFLOPS with sparsity)",
    },
    GpuPeak {
        names: &["B200"],
        flops: 2250e12,
        bandwidth: 8e12,
        source: "NVIDIA Blackwell / DGX B200 datasheet (HGX B200, 1,000 W)",
    },
    GpuPeak {
        names: &["MI300X"],
        flops: 1307.4e12,
        bandwidth: 5.3e12,
        source: "AMD Instinct MI300X datasheet",
    },
];

/// Looks a GPU model up by any of its names, ignoring case and `_`/`-`/space differences.
pub fn lookup(model: &str) -> Option<&'static GpuPeak> {
    let norm = |s: &str| {
        s.chars()
            .filter(|c| !matches!(c, '-' | '_' | ' '))
            .flat_map(char::to_lowercase)
            .collect::<String>()
    };
    let want = norm(model);
    GPUS.iter()
        .find(|g| g.names.iter().any(|n| norm(n) == want))
}

/// Every accepted name, for error messages and docs.
pub fn known_names() -> Vec<&'static str> {
    GPUS.iter().flat_map(|g| g.names.iter().copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups() {
        let h100 = lookup("h100_sxm").unwrap();
        assert_eq!(h100.flops, 989e12);
        assert_eq!(h100.bandwidth, 3.35e12);
        assert_eq!(lookup("H200").unwrap().bandwidth, 4.8e12);
        assert_eq!(lookup("MI300X").unwrap().flops, 1307.4e12);
        assert!(lookup("A10G").is_none(), "A10G has no published figure");
        let names = known_names();
        let unique: std::collections::BTreeSet<_> =
            names.iter().map(|n| n.to_lowercase()).collect();
        assert_eq!(unique.len(), names.len());
    }
}
