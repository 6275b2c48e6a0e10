package main

import (
	"image/color"
	"math"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// series is one set of bars in a chart.
type series struct {
	label  string
	values []float64
}

var palette = []color.Color{
	color.RGBA{R: 0x33, G: 0x66, B: 0xcc, A: 0xff},
	color.RGBA{R: 0xdc, G: 0x39, B: 0x12, A: 0xff},
	color.RGBA{R: 0x10, G: 0x96, B: 0x18, A: 0xff},
}

// barChart writes a grouped bar chart to dir/file (PNG). With logY the
// bars show log10 of the values (at least 1).
func barChart(dir, file, title, ylabel string, names []string, ss []series, logY bool) error {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	w := vg.Points(14)
	if len(ss) == 1 {
		w = vg.Points(22)
	}
	for i, s := range ss {
		vals := make(plotter.Values, len(s.values))
		for j, v := range s.values {
			if logY { // bars need a linear axis: plot log10 of the value
				v = math.Log10(max(v, 1))
			}
			vals[j] = v
		}
		b, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		b.Color = palette[i%len(palette)]
		b.LineStyle.Width = 0
		b.Offset = w * vg.Length(float64(i)-float64(len(ss)-1)/2)
		p.Add(b)
		if len(ss) > 1 {
			p.Legend.Add(s.label, b)
		}
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = 0.5
	p.X.Tick.Label.XAlign = -1
	p.X.Tick.Label.YAlign = -1
	return p.Save(vg.Length(max(6, len(names)))*vg.Inch, 5*vg.Inch, filepath.Join(dir, file))
}
