use wgpu::util::DeviceExt;
fn main() {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let adapter =
        pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY)).remove(0);
    let (device, queue) = pollster::block_on(adapter.request_device(&Default::default())).unwrap();
    let src = r#"
@group(0) @binding(0) var<storage, read> i: array<f32>;
@group(0) @binding(1) var<storage, read_write> o: array<f32>;
@compute @workgroup_size(1)
fn main() {
    o[0] = fma(i[0], i[1], i[2]);
    let p = i[0] * i[1];
    o[1] = p + i[2];
    o[2] = i[3] / i[4];
    o[3] = exp(i[5]);
    o[4] = sqrt(i[4]);
}
"#;
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: None,
        source: wgpu::ShaderSource::Wgsl(src.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let a = 1.0f32 + 2f32.powi(-12);
    let x = 0.3721f32;
    let input = [a, a, -(1.0 + 2f32.powi(-11)), 1.0, 3.0, x];
    let ib = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(&input),
        usage: wgpu::BufferUsages::STORAGE,
    });
    let ob = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let rb = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bg = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: ib.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: ob.as_entire_binding(),
            },
        ],
    });
    let mut enc = device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bg, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }
    enc.copy_buffer_to_buffer(&ob, 0, &rb, 0, 64);
    queue.submit([enc.finish()]);
    rb.slice(..).map_async(wgpu::MapMode::Read, |_| {});
    device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
    let data = rb.slice(..).get_mapped_range().unwrap();
    let o: &[f32] = bytemuck::cast_slice(&data);
    println!("fma {:e} (fused {:e}), mul+add {:e}, 1/3 {:e} vs {:e}, exp {:e} vs {:e} ({} ulp), sqrt3 {:e} vs {:e}", o[0], a.mul_add(a, input[2]), o[1], o[2], 1.0f32/3.0, o[3], x.exp(), (o[3].to_bits() as i64 - x.exp().to_bits() as i64), o[4], 3f32.sqrt());
}
