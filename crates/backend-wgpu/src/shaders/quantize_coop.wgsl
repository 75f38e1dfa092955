// The rounding of quantize_x.wgsl with a workgroup of 64 invocations (or a multiple) over
// four consecutive values each (256 a 64: one block of 256, or eight of 32): the
// block's reductions (the largest magnitude, Q8_K's first value of it, Q8_1's sum) in
// workgroup memory, every value read once and by its own invocation. One invocation a block,
// looping over its values (quantize_block), kept a GPU's invocations waiting on one load
// after another: 80 µs for a 3,584-value row of 256-value blocks on an H100 (session 35).
// Results equal quantize_block's bit for bit: the reductions are a maximum (the first of
// equal magnitudes, as the loop keeps) and an integer sum.

// COOP_LANES, the invocations of the caller's workgroup (a multiple of 64: blocks of 256
// values take 64 invocations, of 32 take 8), is the caller's: 64 for quantize_x_one.wgsl,
// gated_quantize.wgsl and attention_merge_quantize.wgsl, the norm's THREADS for
// add_rms_norm_quantize.wgsl (256 or 1,024: 1,024 or 4,096 values a call).

var<workgroup> coop_abs: array<f32, COOP_LANES>;
var<workgroup> coop_value: array<f32, COOP_LANES>;
var<workgroup> coop_index: array<u32, COOP_LANES>;
var<workgroup> coop_sum: array<i32, COOP_LANES>;

// Rounds `values`, the values first + 4 lane .. first + 4 lane + 3 (`live`: they exist; blocks
// are whole, so a block's invocations are all live or none), in the mode `mode`. Every
// invocation of the workgroup calls it (it holds barriers), `first` a multiple of the block.
fn quantize_coop(first: u32, lane: u32, values: vec4<f32>, live: bool, mode: u32) {
    let block_values = mode_block_values(mode);
    let seg = block_values / 4u;  // invocations a block: 8 or 64
    let at = first + 4u * lane;
    let block = at / block_values;
    let k_mode = mode == 3u || mode == 5u || mode == 8u;
    var amax = 0.0;
    var max_value = 0.0;
    var index = 0xffffffffu;
    if live {
        for (var k = 0u; k < 4u; k++) {
            let a = abs(values[k]);
            if k_mode {
                if a > amax {
                    amax = a;
                    max_value = values[k];
                    index = at + k;
                }
            } else {
                amax = max(amax, a);
            }
        }
    }
    let block_max = coop_block_max(amax, max_value, index, lane, seg, k_mode);
    let block_amax = block_max.x;
    let block_max_value = block_max.y;
    let word = lane % seg;  // this invocation's word of the block's packed bytes
    if mode == 1u || mode == 2u {
        if live {
            for (var k = 0u; k < 4u; k++) {
                if mode == 2u {
                    let bits = bitcast<u32>(values[k]);
                    rounded[at + k] = (bits + 0x7fffu + ((bits >> 16u) & 1u)) & 0xffff0000u;
                } else {
                    rounded[at + k] = bitcast<u32>(f16_rn(values[k]));
                }
            }
        }
    } else if k_mode {
        let packed = mode == 5u;
        let grouped = mode == 8u;
        if live {
            if block_amax == 0.0 {
                if grouped {
                    rounded[block * 72u + word] = 0u;
                    if word == 0u {
                        rounded[block * 72u + 64u] = 0u;
                    }
                } else if packed {
                    rounded[block * 65u + 1u + word] = 0u;
                    if word == 0u {
                        rounded[block * 65u] = 0u;
                    }
                } else {
                    for (var k = 0u; k < 4u; k++) {
                        rounded[at + k] = 0u;
                    }
                }
            } else {
                let iscale = div_rn(-127.0, block_max_value);
                let d = div_rn(1.0, iscale);
                if grouped {
                    var bytes = 0u;
                    for (var k = 0u; k < 4u; k++) {
                        let q = i32(min(127.0, round(iscale * values[k])));
                        bytes |= (bitcast<u32>(q) & 0xffu) << (8u * k);
                    }
                    rounded[block * 72u + word] = bytes;
                    if word == 0u {
                        rounded[block * 72u + 64u] = bitcast<u32>(d);
                    }
                } else if packed {
                    var bytes = 0u;
                    for (var k = 0u; k < 4u; k++) {
                        let q = i32(min(127.0, round(iscale * values[k])));
                        bytes |= (bitcast<u32>(q) & 0xffu) << (8u * k);
                    }
                    rounded[block * 65u + 1u + word] = bytes;
                    if word == 0u {
                        rounded[block * 65u] = bitcast<u32>(d);
                    }
                } else {
                    for (var k = 0u; k < 4u; k++) {
                        rounded[at + k] = bitcast<u32>(d * min(127.0, round(iscale * values[k])));
                    }
                }
            }
        }
    } else {
        // Modes 0, 4, 6 and 7: blocks of 32.
        let unrounded = div_rn(block_amax, 127.0);
        let d = f16_rn(unrounded);
        let id = select(0.0, div_rn(127.0, block_amax), block_amax != 0.0);
        var sum = 0;
        var bytes = 0u;
        for (var k = 0u; k < 4u; k++) {
            let q = round(values[k] * id);
            if mode == 0u {
                if live {
                    rounded[at + k] = bitcast<u32>(d * q);
                }
            } else {
                sum += i32(q);
                bytes |= (bitcast<u32>(i32(q)) & 0xffu) << (8u * k);
            }
        }
        if live && mode == 7u {
            let group = block / 8u;
            rounded[group * 72u + 8u * (block % 8u) + word] = bytes;
            if word == 0u {
                rounded[group * 72u + 64u + block % 8u] = bitcast<u32>(d);
            }
        } else if live && mode != 0u {
            let words = select(9u, 10u, mode == 6u);
            let qs = block * words + select(1u, 2u, mode == 6u);
            rounded[qs + word] = bytes;
            if word == 0u {
                rounded[block * words] = bitcast<u32>(d);
            }
        }
        if mode == 6u {
            let block_sum = coop_block_sum(select(0, sum, live), lane, seg);
            if live && word == 0u {
                let s = f16_rn(unrounded * f32(block_sum));
                rounded[block * 10u + 1u] = bitcast<u32>(s);
            }
        }
    }
    // The next call's reductions may not begin while this one's are still read.
    workgroupBarrier();
}
