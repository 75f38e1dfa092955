//! Which row switches the decoder computes: a row asking for one it does not compute yet is
//! refused at load, by name, so that the layer loop never silently skips a switch.

use runit_backend::Activation;

use crate::arch::{self, Architecture, LogitSoftcap};
use crate::ModelError;

/// The backend activation of `row`'s gated FFN, once the row is one this decoder computes:
/// the row switches it does not implement yet are refused by name, so a row never asks
/// for something the layer loop would silently skip.
pub(crate) fn decoder_activation(row: &Architecture) -> Result<Activation, ModelError> {
    let missing = |feature: &str| ModelError::UnimplementedFeature {
        arch: row.name.to_string(),
        feature: feature.to_string(),
    };
    if !row.norm_placement.has_pre_norms() {
        return Err(missing("sublayers without norms before them"));
    }
    if row.logit_softcap != LogitSoftcap::None {
        return Err(missing("logit soft-capping"));
    }
    Ok(match row.activation {
        arch::Activation::Silu => Activation::Silu,
        arch::Activation::GeluTanh => Activation::GeluTanh,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::NormPlacement;

    #[test]
    fn the_decoder_computes_every_row_of_the_table() {
        for row in arch::ARCHITECTURES {
            assert!(decoder_activation(row).is_ok(), "{}", row.name);
        }
    }

    #[test]
    fn rows_asking_for_what_the_decoder_lacks_are_refused_by_name() {
        let llama = arch::find("llama").expect("the llama row");
        let cases = [
            Architecture {
                norm_placement: NormPlacement::Post,
                ..llama.clone()
            },
            Architecture {
                logit_softcap: LogitSoftcap::FromMetadata,
                ..llama.clone()
            },
        ];
        for row in cases {
            let error = decoder_activation(&row).expect_err("refused");
            assert!(
                matches!(error, ModelError::UnimplementedFeature { .. }),
                "{error}"
            );
        }
    }
}
