//! The `PageLayout` class: the validated block geometry of one engine KV
//! region, which `Client.save_pages` / `Client.restore_pages` copy through.

use orbitkv_client::PageSpec;
use pyo3::prelude::*;

use crate::errors::to_py;

/// The block geometry of one engine KV region (see `orbitkv_client::PageLayout`).
#[pyclass(frozen, module = "orbitkv._native")]
pub(crate) struct PageLayout {
    pub(crate) inner: orbitkv_client::PageLayout,
}

#[pymethods]
impl PageLayout {
    #[new]
    fn new(pages: Vec<(u64, u64, [u64; 4], [u64; 4])>, num_blocks: u32, region_bytes: u64) -> PyResult<Self> {
        let specs: Vec<PageSpec> = pages
            .into_iter()
            .map(|(base, block_stride, shape, strides)| PageSpec {
                base,
                block_stride,
                shape,
                strides,
            })
            .collect();
        let inner = orbitkv_client::PageLayout::new(&specs, num_blocks, region_bytes).map_err(to_py)?;
        Ok(PageLayout { inner })
    }
    #[getter]
    fn block_bytes(&self) -> u64 {
        self.inner.block_bytes()
    }
    #[getter]
    fn num_blocks(&self) -> u32 {
        self.inner.num_blocks()
    }
    #[getter]
    fn region_bytes(&self) -> u64 {
        self.inner.region_bytes()
    }
    fn __repr__(&self) -> String {
        format!(
            "PageLayout(num_blocks={}, block_bytes={}, region_bytes={})",
            self.inner.num_blocks(),
            self.inner.block_bytes(),
            self.inner.region_bytes()
        )
    }
}
