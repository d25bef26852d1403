//! PNG plots of a run: the latency histogram of the grab route, and a timeline of the
//! grab answers per second by kind. Text is drawn with DejaVu Sans compiled into the
//! binary, so the plots render the same on a machine with no fonts installed.

use std::path::Path;
use std::sync::Once;
use std::time::Duration;

use plotters::prelude::*;

use crate::report::Second;

#[derive(Debug, thiserror::Error)]
#[error("drawing {path} failed: {detail}")]
pub struct PlotError {
    path: String,
    detail: String,
}

const FONT: &str = "sans-serif";
const SIZE: (u32, u32) = (1000, 600);
const PALETTE: [RGBColor; 8] = [
    RGBColor(46, 125, 50),   // reserved: green
    RGBColor(198, 40, 40),   // red
    RGBColor(21, 101, 192),  // blue
    RGBColor(239, 108, 0),   // orange
    RGBColor(106, 27, 154),  // purple
    RGBColor(0, 131, 143),   // teal
    RGBColor(93, 64, 55),    // brown
    RGBColor(117, 117, 117), // grey
];

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bundled font is a valid TrueType file; failing here is a build defect.
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| "DejaVu Sans is not a font")
            .expect("the bundled font loads");
    });
}

fn failed(path: &Path) -> impl Fn(&dyn std::fmt::Display) -> PlotError + '_ {
    move |error| PlotError {
        path: path.display().to_string(),
        detail: error.to_string(),
    }
}

/// Bins of `latencies` in milliseconds: `bins` equal buckets from 0 to the largest.
/// Answers (bucket width in ms, count per bucket).
pub fn histogram(latencies: &[Duration], bins: usize) -> (f64, Vec<usize>) {
    let bins = bins.max(1);
    let max_ms = latencies
        .iter()
        .map(|d| d.as_secs_f64() * 1000.0)
        .fold(0.0_f64, f64::max);
    #[allow(clippy::cast_precision_loss)]
    let width = (max_ms / bins as f64).max(0.001);
    let mut counts = vec![0; bins];
    for latency in latencies {
        let ms = latency.as_secs_f64() * 1000.0;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let bin = ((ms / width) as usize).min(bins - 1);
        counts[bin] += 1;
    }
    (width, counts)
}

/// The latency histogram of one route's requests.
pub fn latency_histogram(
    path: &Path,
    title: &str,
    latencies: &[Duration],
) -> Result<(), PlotError> {
    register_font();
    let err = failed(path);
    let (width, counts) = histogram(latencies, 50);
    let tallest = counts.iter().copied().max().unwrap_or(0).max(1);
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    #[allow(clippy::cast_precision_loss)]
    let x_end = width * counts.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 26))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_end, 0..tallest + tallest / 10 + 1)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("latency (ms)")
        .y_desc("requests")
        .label_style((FONT, 16))
        .axis_desc_style((FONT, 18))
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(counts.iter().enumerate().map(|(bin, &count)| {
            #[allow(clippy::cast_precision_loss)]
            let left = width * bin as f64;
            Rectangle::new([(left, 0), (left + width, count)], PALETTE[2].filled())
        }))
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

/// Answers per second after the release, one line per kind.
pub fn timeline(path: &Path, title: &str, seconds: &[Second]) -> Result<(), PlotError> {
    register_font();
    let err = failed(path);
    let mut kinds: Vec<&str> = seconds
        .iter()
        .flat_map(|second| second.answers.keys().map(String::as_str))
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    // Reserved first, so it always gets the same (green) colour.
    kinds.sort_by_key(|kind| *kind != "reserved");
    let tallest = seconds
        .iter()
        .flat_map(|second| second.answers.values().copied())
        .max()
        .unwrap_or(0)
        .max(1);
    let last = seconds.last().map_or(1, |second| second.second.max(1));
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 26))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0..last, 0..tallest + tallest / 10 + 1)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds after the release")
        .y_desc("answers per second")
        .label_style((FONT, 16))
        .axis_desc_style((FONT, 18))
        .draw()
        .map_err(|e| err(&e))?;
    for (index, kind) in kinds.iter().enumerate() {
        let colour = PALETTE[index % PALETTE.len()];
        let points = seconds.iter().map(|second| {
            (
                second.second,
                second.answers.get(*kind).copied().unwrap_or(0),
            )
        });
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(3)))
            .map_err(|e| err(&e))?
            .label(*kind)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 16))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn the_histogram_puts_the_largest_in_the_last_bin() {
        let ms = |n| Duration::from_millis(n);
        let (width, counts) = histogram(&[ms(0), ms(5), ms(9), ms(10)], 2);
        assert!((width - 5.0).abs() < 1e-9);
        assert_eq!(counts, vec![1, 3]);
        let (_, empty) = histogram(&[], 3);
        assert_eq!(empty, vec![0, 0, 0]);
    }

    #[test]
    fn plots_are_written_as_png() {
        let dir = tempfile::tempdir().unwrap();
        let histogram_png = dir.path().join("latency.png");
        let latencies: Vec<Duration> = (1..200).map(|n| Duration::from_micros(n * 137)).collect();
        latency_histogram(&histogram_png, "grab latency", &latencies).unwrap();
        let timeline_png = dir.path().join("timeline.png");
        let seconds: Vec<Second> = (0..5)
            .map(|second| Second {
                second,
                answers: BTreeMap::from([
                    ("reserved".to_owned(), 10 - second as usize),
                    ("sold_out".to_owned(), 3 * second as usize),
                ]),
            })
            .collect();
        timeline(&timeline_png, "answers", &seconds).unwrap();
        for png in [histogram_png, timeline_png] {
            let bytes = std::fs::read(&png).unwrap();
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", png.display());
        }
    }
}
